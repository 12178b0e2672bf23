#!/usr/bin/env bash
# The framework harnesses' pinned packages (validation/<framework>/), installed so that torch stays
# the 2.13.0 CPU build. Run after `pip install -e ".[test,validate]"`.
set -euo pipefail
cd "$(dirname "$0")/.."
pin=$(mktemp)
echo "torch==2.13.0" > "$pin"
# torchtitan 0.3.0 (validation/torchtitan): it imports triton unconditionally; its `datasets`
# dependency asks for huggingface_hub < 2, which the app needs at >= 2.4 (datasets runs with it)
python3 -m pip install --quiet "torchtitan==0.3.0" "triton==3.9.0" "torchao==0.18.0" -c "$pin"
python3 -m pip install --quiet "huggingface_hub>=2.4,<3" -c "$pin"
# Megatron-Core 0.16.1 (validation/megatron), the last release for Python 3.11: numpy and packaging only.
# It is training.framework_version "0.16" (estimator/spec/versions.py), the default.
python3 -m pip install --quiet "megatron-core==0.16.1" -c "$pin"
# Megatron-Core 0.19.0 (framework_version "0.19", the current release) needs Python 3.12 and is not
# installed: its source is a git snapshot of github.com/NVIDIA/Megatron-LM (tag core_v0.19.0, commit
# 5be9626709af2722333bf54797c954c09edeada3), e.g. `git clone --bare https://github.com/NVIDIA/Megatron-LM`
# with MEGATRON_LM_GIT pointing at it. validation/megatron/schedules.py reads its pipeline_parallel/
# schedules.py there (`git show`) and compiles only the pure schedule functions; without the snapshot
# tests/test_megatron_schedules.py checks against the recorded table
# (tests/data/measured/schedules/megatron-interleaved.json) and skips the live run, saying why.
# torchtitan main (framework_version "main", commit b5bcd76c66d0acb1a08b176d9639425bc55e0b2a) is read the
# same way from a snapshot of github.com/pytorch/torchtitan; its memory rules equal 0.3.0's
# (estimator/spec/versions.py), so nothing of it is installed or imported.
# torchtitan 2024-12 (9dec370), 0.1.0 (v0.1.0, f7084fc7) and 0.2.0 (v0.2.0, 29624e37), the releases of
# torchtitan's published benchmarks, are read the same way (`git show <commit>:<path>`) for the rules in
# estimator/memory/titan_releases.py; their activation-checkpointing policies are written out in
# validation/compile_sac.py from that source and run on torchtitan 0.3.0's block; nothing is installed.
# The torch those benchmarks ran (1963fc83, 2024-12-23) is read as torch 2.6.0, its release branch, for
# the rules of estimator/memory/pp_buffers.py and cp_ring.py (distributed/pipelining, fsdp/_fully_shard,
# tensor/experimental/_attention.py): the Python source of its smallest wheel, unpacked and never
# installed, e.g. `pip download torch==2.6.0 --no-deps --only-binary=:all: --platform macosx_11_0_arm64
# --python-version 3.11 -d /tmp/t26 && unzip /tmp/t26/torch-2.6.0-*.whl 'torch/distributed/*'`.
# PEFT (validation/peft): LoRA on the HF models; QLoRA's bitsandbytes layer is emulated there and
# checked against real bitsandbytes 0.49.2 (its CPU build) on tiny runs
python3 -m pip install --quiet "peft==0.21.2" "bitsandbytes==0.49.2" -c "$pin"
# TRL 1.9.0 (validation/accelerate/trl_sft.py: SFTTrainer's step, loss_type nll and chunked_nll): --no-deps, as
# its dependencies are installed already (transformers: the [validate] extra; accelerate: peft's; datasets: torchtitan's;
# jinja2: torch's; packaging) and pip would otherwise move them
python3 -m pip install --quiet --no-deps "trl==1.9.0"
# DeepSpeed 0.19.5 (validation/gpu/deepspeed_step.py's CPU self-test, tests/test_gpu_framework_steps.py; the
# estimator's default DeepSpeed release): an sdist only; DS_BUILD_OPS=0 builds no op (pure Python; its
# hjson, msgpack, ninja, py-cpuinfo, einops, pydantic come from PyPI). Its own venv over the system
# packages: installed beside Accelerate it changes what Accelerate's autocast wrapper does (the accelerate
# harness's records are of a machine without it). The GPU machine gets it carried in .whl/site
# (validation/README.md).
python3 -m venv --system-site-packages .venv/deepspeed
DS_BUILD_OPS=0 .venv/deepspeed/bin/python -m pip install --quiet "deepspeed==0.19.5" -c "$pin"
.venv/deepspeed/bin/python -c "import torch, deepspeed; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# torchtune 0.6.1 (validation/torchtune) needs torchao 0.10.0, which the others cannot share: its own
# venv over the system packages (torch 2.13.0 comes from there, nothing large is downloaded)
python3 -m venv --system-site-packages .venv/torchtune
.venv/torchtune/bin/python -m pip install --quiet "torchtune==0.6.1" "torchao==0.10.0" -c "$pin"
.venv/torchtune/bin/python -c "import torch, torchtune; assert torch.__version__.startswith('2.13.0'), torch.__version__"
python3 -c "import torch, torchtitan, megatron.core, peft, bitsandbytes, huggingface_hub, trl; assert torch.__version__.startswith('2.13.0'), torch.__version__"
rm -f "$pin"
