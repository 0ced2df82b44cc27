"""Bring your own kernel: adapters that make a user's kernel a kdkit backend, and the starter
templates `kdkit new-kernel` copies. cuda: a .cu file through NVRTC (kdkit.byok.cuda).
triton: a @triton.jit kernel and its launcher, on a CPU under Triton's interpreter (kdkit.byok.triton).
starter: `kdkit new-kernel DIR --lang cuda|triton` writes a starter package (kdkit.byok.starter)."""
