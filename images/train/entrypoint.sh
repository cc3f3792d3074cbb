#!/bin/sh
# The image's entrypoint. NVIDIA's NGC bases start with /opt/nvidia/nvidia_entrypoint.sh, which sets up
# CUDA forward compatibility on older data-centre drivers (and prints the base's banner); it stays first
# in the chain where the base has it, then runs `imagenet-train ARGS`.
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    exec /opt/nvidia/nvidia_entrypoint.sh imagenet-train "$@"
fi
exec imagenet-train "$@"
