"""Performance: `kdkit bench` and the tools around it, each `python -m kdkit.perf.<tool>`.

  bench           every backend through the contract on the grid, judged before it is timed
  results         the results files: load, combine, select, the grid's verdicts
  correctness     what a benchmarked output is judged against, and the verdict line
  timing          the L2 flush, the event timer, CUDA graphs, the copy and mma.sync ceilings
  clocks          the SM clock and power sampled while timing
  kernel_ab       A/B timing of the kernel as two or more commits have it
  merge_cost      what the split-KV merge costs beside the partial kernel
  step_cost       what one KV step costs at each split count
  schedule_sweep  the measurements behind kernel.schedule's launch model
  profile_one     one shape through the kernel, for ncu
  ncu_hotspots    where a kernel's time goes, from ncu's source page
  gpu_selfcheck   a small set of kernel cases for compute-sanitizer
  probes/         design probes (fa2_rate, ws_step)
"""
