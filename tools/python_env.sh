# Sourced by the scripts that run zcc's Python side: where the PyTorch 2.x
# virtual environment tools/setup.sh makes lives, and its interpreter.
#   ZCC_VENV          the environment (default ~/.cache/zcc/venv)
#   ZCC_TORCH_PYTHON  an interpreter to use instead (it needs torch >= 2.6,
#                     numpy and safetensors; transformers for the HF example)
ZCC_VENV="${ZCC_VENV:-$HOME/.cache/zcc/venv}"
ZCC_TORCH_PYTHON="${ZCC_TORCH_PYTHON:-$ZCC_VENV/bin/python}"
