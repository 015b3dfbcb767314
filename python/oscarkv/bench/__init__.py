"""oscarkv.bench: `python -m oscarkv.bench model` (model-level decode/throughput/TTFT on the GPU)
and `python -m oscarkv.bench quality` (bits per byte through transformers + oscarkv)."""
