# CPU image of mmserve: `docker build -t mmserve .` then
#   docker run --rm -p 8000:8000 mmserve                      (the built-in tiny-llava preset)
#   docker run --rm -p 8000:8000 -v /path/to/llava-1.5-7b-hf:/models/llava:ro \
#       mmserve /models/llava --served-model-name llava --max-model-len 4k
# Arguments after the image name are `mmserve serve` arguments (vLLM's flag names).
FROM python:3.11-slim

# g++ compiles mmserve's CPU attention kernels against the installed torch; tcmalloc is
# preloaded below (1.04x glibc's malloc in `mmserve bench envs`, benchmarks/README.md)
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/*

# the CPU wheel, pinned: a bare `torch` pulls a multi-GB CUDA build
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --no-cache-dir 'setuptools>=77'

WORKDIR /opt/mmserve
COPY pyproject.toml setup.py README.md LICENSE ./
COPY mmserve ./mmserve
# every kernel variant (the image runs on CPUs other than the one that builds it) and the
# structured extra (xgrammar: a server image answers response_format)
RUN MMSERVE_KERNEL_VARIANTS=all pip install --no-cache-dir --no-build-isolation '.[structured]' \
    && python -c "import mmserve.kernels as k; assert k.cpu_ops(), k.unavailable_reason()"

RUN useradd --create-home --uid 1000 mmserve && mkdir -p /var/cache/mmserve \
    && chown mmserve /var/cache/mmserve
USER mmserve
ENV MMSERVE_CACHE_DIR=/var/cache/mmserve \
    LD_PRELOAD=libtcmalloc_minimal.so.4
WORKDIR /home/mmserve
EXPOSE 8000

# --host 0.0.0.0: the container's port must be reachable through `-p`
# (outside a container mmserve binds 127.0.0.1 unless told otherwise)
ENTRYPOINT ["mmserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["tiny-llava"]
