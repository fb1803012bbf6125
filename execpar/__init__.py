"""execpar: run a simpar plan for real with torch.distributed (gloo on CPU, NCCL on
GPUs) and measure it."""
