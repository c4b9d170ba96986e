"""hcoll for PyTorch."""

# --- c10d backend "hcoll" (hcoll/_c10d.py): registered on import, so that
# dist.init_process_group("hcoll") and dist.new_group(backend="hcoll") work.
from hcoll import _c10d as _hcoll_c10d  # noqa: E402

_hcoll_c10d.register()
ProcessGroupBackend = _hcoll_c10d.BACKEND
