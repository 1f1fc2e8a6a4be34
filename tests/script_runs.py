"""Starting the project's scripts as a user would, for the CPU tests of their paths that need
no GPU: loaded as a module (their pure functions), or run as a process whose environment has
none of a launcher's variables (pytest itself may run under mpiexec or torchrun)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent

_LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCALRANKID", "HYDRA_", "TORCHELASTIC_")
_TORCHRUN_VARS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK"})


def load_script(name: str, module_name: str, folder: str = "scripts") -> ModuleType:
    """``<folder>/<name>`` (scripts/ or benchmarks/) imported as ``module_name`` (a script is
    not a package module)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / folder / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def plain_env(*, repo_on_path: bool = False, **extra: str) -> dict[str, str]:
    """This process's environment without launcher variables, plus ``extra``;
    ``repo_on_path`` puts the repository first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _TORCHRUN_VARS}
    if repo_on_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_script(name: str, *args: str, timeout: float = 60,
               folder: str = "scripts") -> subprocess.CompletedProcess:
    """``python <folder>/<name> args...`` in ``plain_env()``, output captured as text."""
    return subprocess.run([sys.executable, str(REPO / folder / name), *args],
                          capture_output=True, text=True, timeout=timeout, env=plain_env())


def torch_sees_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
