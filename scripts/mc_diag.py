#!/usr/bin/env python3
"""Low-level diagnostics of NVLink peer access and multicast, for every rank of a job.

    mpirun -n 2 python3 scripts/mc_diag.py [--json PATH|-] [--bw-mib 256] [--no-checks]
    torchrun --nproc-per-node 2 scripts/mc_diag.py ...   # the same, over torch.distributed
    python3 scripts/mc_diag.py            # one rank: cross-rank checks are skipped

Each rank probes its host and GPU (versions, device attributes, P2P matrix, NVLink and
fabric clique through NVML, IMEX channels, allocation and multicast granularity, the
multicast policy), then all ranks run the functional checks together: a unicast
SymmetricMemory (RSAR_MULTICAST forced off for it) with cross-rank loads, stores and
atomics, a peer-copy bandwidth figure and the rates SM-issued stores, loads and bulk
copies reach from 8..132 SMs; the multicast check runs only where the policy
allows multicast and every device supports it (the library alone creates the object).
Rank 0 prints one table, rank-ordered, and writes the JSON if asked (``--json -``: JSON
on stdout, the table on stderr).

Exit status, the same on every rank: 0 all checks passed (or were skipped), 1 a check
failed, 3 no usable CUDA GPU on some rank (2 is argparse's usage error).
MPI is used only when the job was started by an MPI launcher, torch.distributed (gloo) when
torchrun started it.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from multicast import host_probes as hostprobe  # noqa: E402
from multicast.bootstrap import Bootstrap  # noqa: E402
from multicast.errors import MulticastPolicyError  # noqa: E402

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_NO_GPU = 3

_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class LocalBootstrap(Bootstrap):
    """The world of one process, for runs without an MPI launcher."""

    rank = 0
    world = 1

    def allgather(self, data: bytes) -> list[bytes]:
        return [bytes(data)]

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        self._check_root(root)
        return bytes(data or b"")

    def barrier(self) -> None:
        pass


def launched_by_mpi(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return any(env.get(v) for v in _MPI_VARS)


def launched_by_torchrun(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """torchrun (or any launcher of torch.distributed's env:// rendezvous) started us."""
    return all(env.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def make_diag_bootstrap() -> Bootstrap:
    # Importing mpi4py.MPI initialises MPI: only do it when a launcher started us, so a
    # plain run works on hosts without an MPI runtime.
    if not launched_by_mpi():
        if launched_by_torchrun():
            # gloo: the object collectives run on the CPU, so the ranks meet even when a
            # GPU is missing or broken (what the diagnostics are for)
            import torch.distributed as dist

            from multicast.bootstrap import TorchBootstrap
            if not dist.is_initialized():
                dist.init_process_group("gloo")
                atexit.register(dist.destroy_process_group)
            return TorchBootstrap(None)
        return LocalBootstrap()
    from mpi4py import MPI

    from multicast.bootstrap import MpiBootstrap

    return MpiBootstrap(MPI.COMM_WORLD)


# ---- probing --------------------------------------------------------------------------

def _driver_or_reason() -> tuple[Any, str | None]:
    try:
        from multicast.driver import default_driver

        return default_driver(), None
    except ImportError as e:
        return None, f"the CUDA Python bindings are not installed (cuda-bindings): {e}"


def no_gpu_reason(count_probe: dict[str, Any]) -> str | None:
    """Why this rank has no usable GPU, in words; None when it has one."""
    errors = count_probe.get("errors", {})
    init = errors.get("cuInit")
    if init == "CUDA_DRIVER_NOT_FOUND":
        return "the CUDA driver library (libcuda.so) is not installed or cannot be loaded"
    if init == "CUDA_ERROR_NO_DEVICE":
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "the CUDA driver reports no device" + (
            f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else "")
    if init:
        return f"cuInit failed: {init}"
    if count_probe.get("count") is None:
        return f"cuDeviceGetCount failed: {errors.get('count')}"
    if count_probe["count"] == 0:
        return "0 CUDA devices visible"
    return None


def choose_device(rank: int, count: int, explicit: int | None) -> int:
    if explicit is not None:
        if not 0 <= explicit < count:
            raise ValueError(f"--device {explicit} out of range: {count} device(s) visible")
        return explicit
    lr = hostprobe.local_rank()
    return (rank if lr is None else lr) % count


def probe_rank(bs: Bootstrap, drv: Any, device_arg: int | None,
               with_nvml: bool = True) -> dict[str, Any]:
    """Everything one rank can find out alone (no collective calls, no allocations)."""
    from multicast import probes
    from multicast.handles import KINDS

    rep: dict[str, Any] = {"rank": bs.rank, "world": bs.world, **hostprobe.host_info(),
                           "no_gpu": None, "checks": []}
    count = probes.device_count(drv)
    rep["no_gpu"] = no_gpu_reason(count)
    if rep["no_gpu"]:
        return rep
    n = int(count["count"])
    rep["device_count"] = n
    try:
        dev = choose_device(bs.rank, n, device_arg)
    except ValueError as e:
        rep["no_gpu"] = str(e)
        return rep
    rep["device"] = dev
    rep["versions"] = {"cuda_driver_api": probes.driver_version(drv).get("text"),
                       "cuda_bindings": rep.get("cuda_bindings"),
                       "nvrtc": hostprobe.nvrtc_version()}
    attrs, extras = probes.device_attributes(dev, drv), hostprobe.device_extras(dev, drv)
    rep["gpu"] = {**attrs, **extras, "errors": {**attrs["errors"], **extras["errors"]}}
    rep["p2p"] = probes.p2p_matrix(range(n), drv)
    rep["nvml"] = (hostprobe.nvml_info(rep["gpu"].get("pci_bus_id")) if with_nvml
                   else {"errors": {"nvml": "not queried (--no-nvml)"}})
    rep["versions"]["driver"] = rep["nvml"].get("driver_version")
    rep["imex"] = hostprobe.imex_channels()
    # A multicast team has one device per rank; a lone rank asks about all visible GPUs.
    team = bs.world if bs.world > 1 else n
    rep["granularity"] = {
        "allocation": {k: probes.allocation_granularity(dev, k, drv) for k in KINDS},
        "multicast": {k: probes.multicast_granularity(team, k, drv=drv) for k in KINDS},
        "multicast_team": team,
    }
    rep["policy"] = local_policy()
    return rep


def local_policy(env: Any = None) -> dict[str, Any]:
    from multicast.policy import decide

    try:
        d = decide(os.environ if env is None else env)
    except (ValueError, MulticastPolicyError) as e:
        return {"requested": None, "allowed": False, "reason": None, "error": str(e)}
    return {"requested": d.requested, "allowed": d.allowed, "reason": d.reason, "error": None}


def resolve_policy(rep: dict[str, Any], group: list[dict[str, Any]]) -> None:
    """Fill in whether the group would use multicast and why (same rule as the library)."""
    from multicast.policy import PolicyDecision, resolve

    pol = rep["policy"]
    if pol["error"]:
        pol["use_multicast"], pol["decision"] = False, f"invalid configuration: {pol['error']}"
        return
    forbidding = [(g["rank"], g["policy"]) for g in group
                  if not g["policy"]["allowed"] or g["policy"]["error"]]
    if not pol["allowed"]:
        pol["use_multicast"], pol["decision"] = False, pol["reason"]
        return
    if forbidding:
        r, p = forbidding[0]
        pol["use_multicast"] = False
        pol["decision"] = f"rank {r}: {p['reason'] or p['error']}"
        on = [g["rank"] for g in group if g["policy"]["requested"] == "on"]
        if on:  # the library refuses this mix on every rank
            pol["error"] = f"RSAR_MULTICAST=on on rank(s) {on}, but {pol['decision']}"
        return
    if rep["world"] == 1:
        pol["use_multicast"], pol["decision"] = False, "a single rank has no peer to multicast to"
        return
    unsupported = [f"rank {g['rank']} device {g['device']}" for g in group
                   if not g["gpu"].get("multicast_supported")]
    try:
        use, why = resolve(PolicyDecision(pol["requested"], True, pol["reason"]),
                           not unsupported, "no multicast support on " + ", ".join(unsupported))
    except MulticastPolicyError as e:
        use, why = False, str(e)
        pol["error"] = str(e)
    pol["use_multicast"], pol["decision"] = use, why


# ---- functional checks ------------------------------------------------------------------

def _check(name: str, status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, **extra}


def _guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    # Collective steps fail on every rank alike (PeerError); anything else is local, and
    # still recorded rather than aborting the remaining checks.
    try:
        return fn()
    except Exception as e:
        return _check(name, "fail", f"{type(e).__name__}: {e}")


def run_checks(rep: dict[str, Any], bs: Bootstrap, drv: Any, bw_bytes: int,
               bw_iters: int) -> list[dict[str, Any]]:
    """The collective checks; every rank runs the same sequence."""
    from multicast import peer_check as pc
    from multicast.symmetric import SymmetricMemory

    dev = rep["device"]
    checks: list[dict[str, Any]] = []
    pol = rep["policy"]
    checks.append(_check("policy", "fail" if pol["error"] else "pass", pol["error"] or
                         f"{'multicast' if pol['use_multicast'] else 'unicast'}: "
                         f"{pol['decision']}"))

    checks.append(_guarded("fabric handle export", lambda: fabric_check(rep, drv)))
    checks.append(cluster_check(dev, drv))
    kernels, why_no_kernels = pc.load_kernels(bs, dev, drv)
    unicast_env = {**os.environ, "RSAR_MULTICAST": "off"}
    try:
        sm = None

        def alloc() -> dict[str, Any]:
            nonlocal sm
            sm = SymmetricMemory(pc.region_bytes(bs.world), bs, driver=drv, env=unicast_env,
                                 device=dev)
            return _check("unicast symmetric memory", "pass",
                          f"{_size(sm.nbytes)} on device {sm.device}, {sm.handle_type} handles, "
                          f"granularity {_size(sm.granularity)}, {sm.transport}",
                          handle_type=sm.handle_type, transport=sm.transport)

        checks.append(_guarded("unicast symmetric memory", alloc))
        if sm is not None:
            def pattern() -> dict[str, Any]:
                return pc.pattern_check(sm, bs, kernels, drv).as_dict()

            def atomics() -> dict[str, Any]:
                r = pc.atomic_check(sm, bs, kernels, drv)
                if r.ok is None and why_no_kernels:
                    r.detail = f"skipped: no check kernels: {why_no_kernels}"
                return r.as_dict()

            def close() -> dict[str, Any]:
                sm.close()
                return _check("unicast close", "pass", "collective teardown")

            checks.append(_guarded("peer load/store", pattern))
            checks.append(_guarded("peer atomics", atomics))
            checks.append(_guarded("unicast close", close))
        if bs.world == 1:
            checks.append(_check("cross-rank checks", "skip",
                                 "world of 1: run under mpirun -n 2 (or more) for peer checks"))
        elif bw_bytes > 0:
            def bandwidth() -> dict[str, Any]:
                with SymmetricMemory(2 * bw_bytes, bs, driver=drv, env=unicast_env,
                                     device=dev) as big:
                    return pc.bandwidth_check(big, bs, bw_bytes, bw_iters, drv).as_dict()

            checks.append(_guarded("peer copy bandwidth", bandwidth))

            def sm_bandwidth() -> dict[str, Any]:
                with SymmetricMemory(2 * bw_bytes, bs, driver=drv, env=unicast_env,
                                     device=dev) as big:
                    return pc.sm_bandwidth_check(big, bs, kernels, bw_bytes, drv=drv).as_dict()

            checks.append(_guarded("SM-driven peer bandwidth", sm_bandwidth))
        checks.append(_guarded("multicast ld_reduce/st",
                               lambda: multicast_check(rep, bs, drv, kernels)))
    finally:
        if kernels is not None:
            with pc.device_scope(drv, dev):
                kernels.unload()
    return checks


def cluster_check(dev: int, drv: Any) -> dict[str, Any]:
    """Informational: the clusters of 2 and 4 CTAs the GPU holds at once at one CTA per SM,
    which the plain GEMM's cluster plans count (GPC layouts differ between boards of one
    model: H100s of 132 SMs hold 30 or 32 4x1 clusters, and the plans at M 193-256 follow).
    A refused probe skips (the op asks the CuTe DSL instead)."""
    try:
        from launch.occupancy import max_active_clusters
        from multicast import peer_check as pc
        with pc.device_scope(drv, dev):
            pairs, quads = (max_active_clusters(dev, n, drv) for n in (2, 4))
    except Exception as e:
        return _check("cluster occupancy", "skip", f"not probed: {type(e).__name__}: {e}")
    return _check("cluster occupancy", "pass", f"{pairs} 2x1 and {quads} 4x1 clusters "
                  f"resident at one CTA per SM", pairs=pairs, quads=quads)


def fabric_check(rep: dict[str, Any], drv: Any) -> dict[str, Any]:
    """Informational: POSIX fds serve on one host, so a refused export is no failure."""
    from multicast import peer_check as pc

    res = pc.fabric_export(rep["device"], drv)
    if res["exported"]:
        return _check("fabric handle export", "pass", "a FABRIC handle was exported", **res)
    why = res["error"]
    if "NOT_PERMITTED" in (why or "") and not rep.get("imex", {}).get("channels"):
        why += " (this process can use no IMEX channel)"
    return _check("fabric handle export", "skip", f"not exportable: {why}; POSIX fds serve "
                  "on one host", **res)


def multicast_check(rep: dict[str, Any], bs: Bootstrap, drv: Any, kernels: Any) -> dict[str, Any]:
    """Multicast only behind the policy: the group's decision (equal on every rank)
    decides, and SymmetricMemory itself decides again before creating anything."""
    from multicast import peer_check as pc
    from multicast.symmetric import SymmetricMemory

    name = "multicast ld_reduce/st"
    pol = rep["policy"]
    if not pol["use_multicast"]:
        return _check(name, "skip", f"skipped: {pol['decision']}")
    with SymmetricMemory(pc.region_bytes(bs.world), bs, driver=drv, device=rep["device"]) as sm:
        if sm.transport != "multicast":
            # Allowed and supported, yet setup fell back: exactly what this tool is for.
            return _check(name, "fail", f"multicast setup fell back to unicast: "
                                        f"{sm.policy_reason}")
        return pc.multicast_check(sm, bs, kernels, drv).as_dict()


# ---- report ---------------------------------------------------------------------------

def exit_code(reports: list[dict[str, Any]]) -> int:
    if any(r.get("no_gpu") for r in reports):
        return EXIT_NO_GPU
    if any(c.get("status") == "fail" for r in reports for c in r.get("checks", [])):
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def _yn(v: Any) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _p2p_grid(p2p: list[dict[str, Any]], n: int) -> list[str]:
    cell: dict[tuple[int, int], str] = {}
    for e in p2p:
        acc, atom = e.get("access_supported"), e.get("native_atomic_supported")
        cell[(e["src"], e["dst"])] = "?" if acc is None else (
            "A+" if acc and atom else "A" if acc else "-")
    width = max(3, len(str(n - 1)) + 1)
    head = "    " + "".join(f"{d:>{width}}" for d in range(n))
    rows = [f"{s:>3} " + "".join(f"{('.' if s == d else cell.get((s, d), '?')):>{width}}"
                                 for d in range(n)) for s in range(n)]
    return [head, *rows, "    (A+ access and native atomics, A access only, - none)"]


def _gran(g: dict[str, Any]) -> str:
    if g.get("minimum") is None:
        err = next(iter(g.get("errors", {}).values()), "?")
        return f"n/a ({err})"
    return f"{_size(g['minimum'])} min / {_size(g['recommended'])} rec"


def format_rank(rep: dict[str, Any], shown_p2p: dict[str, Any] | None = None) -> list[str]:
    """The table rows of one rank's report."""
    head = (f"== rank {rep['rank']} | host {rep.get('host')} | pid {rep.get('pid')}"
            + (f" | device {rep['device']}" if "device" in rep else "") + " ==")
    lines = [head]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<16} {text}")

    if rep.get("no_gpu"):
        row("GPU", f"none: {rep['no_gpu']}")
        return lines
    g, v = rep["gpu"], rep["versions"]
    cc = g.get("compute_capability")
    row("GPU", f"{g.get('name')}, compute capability {cc}, {g.get('sm_count')} SMs, "
               f"{_size(g.get('total_memory'))}, PCI {g.get('pci_bus_id')}")
    nvrtc = v["nvrtc"]["version"] or f"unavailable ({v['nvrtc']['error']})"
    row("versions", f"driver {v.get('driver') or '?'}, CUDA (driver API) "
                    f"{v.get('cuda_driver_api')}, cuda-bindings {v.get('cuda_bindings')}, "
                    f"NVRTC {nvrtc}, Python {rep.get('python')}")
    row("attributes", f"multicast {_yn(g.get('multicast_supported'))}, fabric handles "
                      f"{_yn(g.get('fabric_handle_supported'))}, POSIX-fd handles "
                      f"{_yn(g.get('posix_fd_handle_supported'))}, VMM "
                      f"{_yn(g.get('vmm_supported'))}, GPUDirect RDMA with VMM "
                      f"{_yn(g.get('gpudirect_rdma_with_vmm'))}")
    n = rep.get("device_count", 0)
    if n < 2:
        row("P2P", "one visible GPU, no pairs")
    elif shown_p2p is not None and shown_p2p.get("p2p") == rep["p2p"]:
        row("P2P", f"as rank {shown_p2p['rank']} (same host, same matrix)")
    else:
        grid = _p2p_grid(rep["p2p"], n)
        row("P2P", "from (rows) to (columns):")
        lines.extend(f"  {'':<16} {x}" for x in grid)
    nv = rep.get("nvml", {})
    nverr = nv.get("errors", {})
    if nv.get("nvlink"):
        link = nv["nvlink"]
        row("NVLink", f"{link['active']} of {link['links']} links active, version "
                      f"{', '.join(link['versions']) or '?'} (via {nv.get('source')})")
    else:
        row("NVLink", f"unknown: {nverr.get('nvml') or nverr.get('nvlink') or 'no links'}")
    fab = nv.get("fabric")
    if fab:
        row("fabric", f"clique {fab['clique_id']}, state {fab['state']}, cluster "
                      f"{fab['cluster_uuid'] or 'none'}")
    elif "fabric" in nverr:
        row("fabric", f"unknown: {nverr['fabric']}")
    imex = rep.get("imex", {})
    row("IMEX channels", ", ".join(imex.get("channels", [])) or
        f"none ({imex.get('dir')} {'empty' if imex.get('present') else 'absent'})")
    gr = rep["granularity"]
    row("granularity", "alloc " + "; ".join(f"{k} {_gran(x)}" for k, x in
                                           gr["allocation"].items()))
    row("", f"multicast ({gr['multicast_team']} devices) " + "; ".join(
        f"{k} {_gran(x)}" for k, x in gr["multicast"].items()))
    pol = rep["policy"]
    if pol["error"]:
        row("policy", f"invalid: {pol['error']}")
    else:
        why = "" if pol.get("decision") == pol["reason"] else f" ({pol.get('decision')})"
        row("policy", f"{pol['reason']} -> "
                      f"{'multicast' if pol.get('use_multicast') else 'unicast'}{why}")
    if rep["checks"]:
        lines.append("  checks")
        for c in rep["checks"]:
            val = f" [{c['value']} {c.get('unit', '')}]" if c.get("value") is not None else ""
            lines.append(f"    {c['status'].upper():<5} {c['name']:<26} {c['detail']}{val}")
    return lines


def format_table(reports: list[dict[str, Any]]) -> str:
    """The human-readable report of all ranks, rank-ordered, with a summary line."""
    reports = sorted(reports, key=lambda r: r["rank"])
    lines = [f"rsar mc_diag: {len(reports)} rank(s)"]
    first_on_host: dict[str, dict[str, Any]] = {}
    for rep in reports:
        shown = first_on_host.get(rep.get("host", ""))
        lines.extend(format_rank(rep, shown))
        if shown is None and not rep.get("no_gpu"):
            first_on_host[rep.get("host", "")] = rep
    statuses = [c["status"] for r in reports for c in r.get("checks", [])]
    code = exit_code(reports)
    no_gpu = [r["rank"] for r in reports if r.get("no_gpu")]
    if no_gpu:
        lines.append(f"no CUDA GPU on rank(s) {no_gpu}: nothing checked -> exit {code}")
    else:
        lines.append(f"summary: {statuses.count('pass')} passed, {statuses.count('fail')} "
                     f"failed, {statuses.count('skip')} skipped -> exit {code}")
    return "\n".join(lines)


def to_json(reports: list[dict[str, Any]]) -> str:
    doc = {"tool": "rsar mc_diag", "world": len(reports), "exit_code": exit_code(reports),
           "ranks": sorted(reports, key=lambda r: r["rank"])}
    return json.dumps(doc, indent=2, default=str)


def no_gpu_message(reports: list[dict[str, Any]]) -> str:
    return "\n".join(f"mc_diag: no CUDA GPU on host {r.get('host')} (rank {r['rank']}): "
                     f"{r['no_gpu']}" for r in reports if r.get("no_gpu"))


# ---- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout)")
    ap.add_argument("--device", type=int, default=None,
                    help="CUDA ordinal to use (default: local rank modulo visible devices)")
    ap.add_argument("--bw-mib", type=int, default=256,
                    help="bytes per peer copy in the bandwidth figure, MiB (0: skip)")
    ap.add_argument("--bw-iters", type=int, default=5)
    ap.add_argument("--no-checks", action="store_true",
                    help="probe only: no allocation, no functional check")
    ap.add_argument("--no-nvml", action="store_true", help="skip the NVML queries")
    return ap.parse_args(argv)


def diagnose(bs: Bootstrap, drv: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Probe, agree, check; every rank returns the reports of all ranks."""
    rep = probe_rank(bs, drv, args.device, with_nvml=not args.no_nvml)
    group = [json.loads(b) for b in bs.allgather(json.dumps(rep, default=str).encode())]
    if any(g.get("no_gpu") for g in group):
        return group
    resolve_policy(rep, group)
    if not args.no_checks:
        rep["checks"] = run_checks(rep, bs, drv, args.bw_mib << 20, args.bw_iters)
    return [json.loads(b) for b in bs.allgather(json.dumps(rep, default=str).encode())]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bs = make_diag_bootstrap()
    drv, why = _driver_or_reason()
    if drv is None:
        rep = {"rank": bs.rank, "world": bs.world, **hostprobe.host_info(), "no_gpu": why,
               "checks": []}
        reports = [json.loads(b) for b in bs.allgather(json.dumps(rep).encode())]
    else:
        reports = diagnose(bs, drv, args)
    code = exit_code(reports)
    if bs.rank == 0:
        text_out = sys.stderr if args.json == "-" else sys.stdout
        if code == EXIT_NO_GPU:
            print(no_gpu_message(reports), file=text_out)
        else:
            print(format_table(reports), file=text_out)
        if args.json:
            doc = to_json(reports)
            if args.json == "-":
                print(doc)
            else:
                Path(args.json).write_text(doc + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
