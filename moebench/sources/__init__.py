"""Where kernels come from besides moebench's own code: upstream Megatron kernels imported at run
time (`upstream`), and a user's own kernels from a file or an entry point (`plugins`)."""
