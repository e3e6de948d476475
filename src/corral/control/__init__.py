"""The control plane: catalog, scheduler, balancer, supervisor, events. Never imports llama_cpp."""
