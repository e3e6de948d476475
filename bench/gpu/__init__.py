"""corral on a CUDA GPU next to llama-server: ``bash bench/gpu/run.sh`` (prepared by ``bench/gpu/prepare.sh``)."""
