#!/bin/sh
# The image's entrypoint. NVIDIA's NGC bases start with /opt/nvidia/nvidia_entrypoint.sh, which sets up
# CUDA forward compatibility on older data-centre drivers (and prints the base's banner); it stays first
# in the chain where the base has it, then runs `imagenet-train ARGS`.
set -- imagenet-train "$@"
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    set -- /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
# As the container's pid 1 (`docker run`, a pod without a shared process namespace), tini runs the chain as its
# child: it reaps the orphans that `pipe:` shard commands leave behind, which a rank as pid 1 never would, and
# passes every signal on to that child, as the runtime sent it.
if [ "$$" = 1 ]; then
    set -- tini -- "$@"
fi
exec "$@"
