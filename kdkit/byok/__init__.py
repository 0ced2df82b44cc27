"""Bring your own kernel: adapters that make a user's kernel a kdkit backend, and the starter
templates `kdkit new-kernel` copies. cuda: a .cu file through NVRTC (kdkit.byok.cuda)."""
