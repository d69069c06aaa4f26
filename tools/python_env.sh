# Sourced by the scripts that run zcc's Python side: where the PyTorch 2.x
# virtual environment tools/setup.sh makes lives, and its interpreter.
#   ZCC_VENV          the environment (default ~/.cache/zcc/venv)
#   ZCC_TORCH_PYTHON  an interpreter to use instead (it needs torch >= 2.6,
#                     numpy and safetensors; transformers for the HF example)
#   ZCC_PADDLE_VENV   zcc.paddle's environment (default ~/.cache/zcc/paddle-venv:
#                     PaddlePaddle's CPU wheel, tools/requirements-paddle.txt)
#   ZCC_PADDLEFORMERS_VENV  zcc.paddleformers' (default
#                     ~/.cache/zcc/paddleformers-venv: PaddleFormers and its
#                     stack, tools/requirements-paddleformers.txt)
ZCC_VENV="${ZCC_VENV:-$HOME/.cache/zcc/venv}"
ZCC_PADDLE_VENV="${ZCC_PADDLE_VENV:-$HOME/.cache/zcc/paddle-venv}"
ZCC_PADDLEFORMERS_VENV="${ZCC_PADDLEFORMERS_VENV:-$HOME/.cache/zcc/paddleformers-venv}"
ZCC_TORCH_PYTHON="${ZCC_TORCH_PYTHON:-$ZCC_VENV/bin/python}"
