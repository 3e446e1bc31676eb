"""looprun: the run infrastructure loopvision's training and evaluation commands share.

Nothing here knows a model architecture (those live in :mod:`loopcore`, :mod:`loopvae` and :mod:`srvit`):

* :mod:`looprun.config` -- typed configs from presets, YAML files and ``--set key=value`` overrides;
* :mod:`looprun.training_loop` -- the step loop (:class:`~looprun.training_loop.TrainingLoop`) and the loader
  contract it relies on (:class:`~looprun.training_loop.TrainingLoader`);
* :mod:`looprun.checkpoint`, :mod:`looprun.run_lock`, :mod:`looprun.signals` -- durable checkpoints,
  one writer per run directory, checkpoint-and-stop on SIGTERM/SIGINT;
* :mod:`looprun.distributed`, :mod:`looprun.determinism` -- torchrun/DDP context, per-step reseeding;
* :mod:`looprun.optimization`, :mod:`looprun.memory`, :mod:`looprun.run_logger` -- LR schedules and EMA
  weights, peak-memory measurement, TensorBoard and progress logging;
* :mod:`looprun.release` -- release artifacts (diffusers layout + card) and :func:`~looprun.release.load_artifact`;
* :mod:`looprun.speed` -- memory format, ``torch.compile`` and CPU-allocator switches of the command lines;
* :mod:`looprun.cli_errors` -- one-line error reports for the command lines.

``import looprun`` imports none of them; import the module you need.
"""
