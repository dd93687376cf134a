#!/bin/sh
# verl PPO with weightcast as its checkpoint engine: the overrides that select
# it, on top of a verl run's own (data, model, rollout disaggregated from the
# trainer). "++" adds a key or overrides it, whichever the verl version needs.
# Every engine_kwargs.weightcast key is a keyword of
# weightcast.verl.WeightcastCheckpointEngine (see its docstring).
exec python3 -m verl.trainer.main_ppo "$@" \
	actor_rollout_ref.rollout.checkpoint_engine.backend=weightcast \
	++actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=weightcast.verl \
	actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1024 \
	++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.weightcast.transport=auto \
	++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.weightcast.rollout_dtype=bfloat16 \
	++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.weightcast.timeout=120 \
	++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.weightcast.checksum=true
