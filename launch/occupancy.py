"""How many clusters of n CTAs a GPU holds at once at one CTA per SM.

A persistent grid of 2x1 clusters needs every cluster resident, or a CTA could wait forever
on one that never starts; how many fit depends on the GPU's GPC layout, not only its SM
count. The driver answers for a function and a launch shape (``cuOccupancyMaxActiveClusters``);
the function here is an empty kernel given as PTX, which the driver loads in milliseconds, so
the first call of a worker with a precompiled kernel cache does not wait on a compiler.
"""
from __future__ import annotations

from typing import Any

__all__ = ["max_active_clusters"]

PROBE = b"rsar_occupancy_probe"
# sm_90 PTX runs (JIT-compiled by the driver) on sm_90 and every later GPU
PROBE_PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n"
             b".visible .entry " + PROBE + b"()\n{\n\tret;\n}\n\0")
PROBE_THREADS = 128


def max_active_clusters(device_index: int, cluster_size: int, drv: Any = None) -> int:
    """Clusters of ``cluster_size`` CTAs resident at once on device ``device_index`` when each
    CTA takes a whole SM's shared memory (as rsar's kernels do). Needs the device's context
    current (torch's, once it has touched the device)."""
    if not 1 <= cluster_size <= 32:
        raise ValueError(f"cluster_size must be in [1, 32], got {cluster_size}")
    if drv is None:
        from multicast.driver import default_driver
        drv = default_driver()
    raw = drv.raw
    attr = raw.CUdevice_attribute
    fattr = raw.CUfunction_attribute
    module = drv.cuModuleLoadData(PROBE_PTX)
    try:
        fn = drv.cuModuleGetFunction(module, PROBE)
        dev = drv.cuDeviceGet(device_index)
        optin = drv.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)
        drv.cuFuncSetAttribute(fn, fattr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin)
        # clusters beyond the portable size of 8 are allowed, as on the real kernels' launch
        drv.cuFuncSetAttribute(fn, fattr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        smem = drv.cuOccupancyAvailableDynamicSMemPerBlock(fn, 1, PROBE_THREADS)
        config = raw.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = PROBE_THREADS, 1, 1
        config.sharedMemBytes = smem
        dims = raw.CUlaunchAttribute()
        dims.id = raw.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        value = raw.CUlaunchAttributeValue()
        value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster_size, 1, 1
        dims.value = value
        config.attrs = [dims]
        config.numAttrs = 1
        return int(drv.cuOccupancyMaxActiveClusters(fn, config))
    finally:
        drv.cuModuleUnload(module)
