"""The long studies: shell scripts, and the device lease's driver (``studies/gpu.py``)."""
