"""Device telemetry: what the agent reports in ``hello`` and ``heartbeat``.

NVIDIA GPUs are read through NVML (the ``pynvml`` module of ``nvidia-ml-py``) when
it is importable and finds at least one GPU (kind ``gpu``). Otherwise the CPU is
reported as device 0 of kind ``cpu``: its name from ``/proc/cpuinfo`` (or
``platform.processor()``), no temperature, and its system memory where a GPU
reports VRAM (total and available, MiB; docs/protocol-notes.md 2026-12-07).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from typing import Any

import psutil

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass
class DeviceInfo:
    """Static facts about one device, as sent in ``hello``.

    ``index`` is the device number used in offers; ``kind`` is ``"gpu"`` or
    ``"cpu"``; ``vram_total_mb`` is in MiB (a CPU's: its system memory).
    """

    index: int
    name: str
    vram_total_mb: int
    kind: str = "gpu"


@dataclass
class DeviceStatus:
    """Live readings of one device: ``temp_c`` in °C (None when unknown),
    ``vram_free_mb`` in MiB (a CPU's: its available system memory)."""

    index: int
    temp_c: float | None
    vram_free_mb: int


class Telemetry:
    """Reads the machine's devices: NVIDIA GPUs via NVML, else the CPU as device 0.

    ``name_override`` and ``kind_override`` (``"gpu"``/``"cpu"``) replace the
    name and kind reported for ``override_index`` (for demos and tests that
    simulate a given device; placement goes by what Ballast measures, not by
    these).
    """

    def __init__(
        self,
        *,
        name_override: str | None = None,
        kind_override: str | None = None,
        override_index: int = 0,
    ) -> None:
        if kind_override not in (None, "gpu", "cpu"):
            raise ValueError(
                f"kind_override must be 'gpu' or 'cpu', not {kind_override!r}"
            )
        self._nvml: Any = _nvml_init()
        self._name_override = name_override
        self._kind_override = kind_override
        self._override_index = override_index

    @property
    def kind(self) -> str:
        """``"nvml"`` when GPUs are read through NVML, else ``"cpu"``."""
        return "nvml" if self._nvml is not None else "cpu"

    def devices(self) -> list[DeviceInfo]:
        """Return every device of the machine (at least one)."""
        if self._nvml is not None:
            try:
                infos = _nvml_devices(self._nvml)
            except Exception as exc:  # NVML can fail at any call (driver reload)
                log.warning("NVML failed, reporting the CPU instead: %s", exc)
                infos = [_cpu_device()]
        else:
            infos = [_cpu_device()]
        for info in infos:
            if info.index == self._override_index:
                info.name = self._name_override or info.name
                info.kind = self._kind_override or info.kind
        return infos

    def statuses(self) -> list[DeviceStatus]:
        """Return live readings (temperature °C, free VRAM MiB) of every device."""
        if self._nvml is not None:
            try:
                return _nvml_statuses(self._nvml)
            except Exception as exc:
                log.warning("NVML reading failed, reporting the CPU instead: %s", exc)
        return [
            DeviceStatus(
                index=0,
                temp_c=None,
                vram_free_mb=int(psutil.virtual_memory().available // MIB),
            )
        ]

    def memory_used_mb(self, index: int) -> int | None:
        """Memory this process uses on device ``index`` (MiB), None when unknown.

        On a GPU: the VRAM NVML attributes to this process, or failing that the
        device's used VRAM. On the CPU: this process's resident set size.
        """
        if self._nvml is None:
            return int(psutil.Process().memory_info().rss // MIB)
        try:
            return _nvml_used_mb(self._nvml, index)
        except Exception as exc:
            log.debug("NVML memory reading failed: %s", exc)
            return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _cpu_device() -> DeviceInfo:
    return DeviceInfo(
        index=0,
        name=_cpu_name(),
        vram_total_mb=int(psutil.virtual_memory().total // MIB),
        kind="cpu",
    )


def _nvml_init() -> Any:
    """Return the initialised ``pynvml`` module, or None when no GPU is usable."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
    except Exception as exc:
        log.debug("NVML unavailable: %s", exc)
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_devices(nvml: Any) -> list[DeviceInfo]:
    infos = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        infos.append(
            DeviceInfo(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                vram_total_mb=int(memory.total // MIB),
            )
        )
    return infos


def _nvml_statuses(nvml: Any) -> list[DeviceStatus]:
    statuses = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            temp: float | None = float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
        except Exception:
            temp = None
        statuses.append(
            DeviceStatus(index=index, temp_c=temp, vram_free_mb=int(memory.free // MIB))
        )
    return statuses


def _nvml_used_mb(nvml: Any, index: int) -> int:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    pid = os.getpid()
    try:
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory:
                return int(proc.usedGpuMemory // MIB)
    except Exception:
        pass
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used // MIB)
