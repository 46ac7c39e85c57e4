# One image for web, workers and beat; the compose file picks the command.
# CPU wheels by default; the GPU worker image is built with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential libpq5 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
RUN pip install --extra-index-url "$TORCH_INDEX" -r requirements.txt

COPY . .

# Run as an unprivileged user; checkpoints and keys live on mounted volumes.
RUN useradd --system --uid 10001 --home /app erasure \
 && mkdir -p /data/checkpoints /data/corpora /run/secrets \
 && chown -R erasure /data
USER erasure

EXPOSE 8000
CMD ["gunicorn", "deletion.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
