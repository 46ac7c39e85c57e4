# One image for web, workers and beat; the compose file picks the command.
# CPU wheels by default; the GPU worker image is built with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124
# and the commit it runs (stated in certificates) with
#   --build-arg CODE_VERSION=$(git rev-parse --short=12 HEAD)
#
# Two stages: `build` has the compilers and pip and fills a virtual environment;
# `run` gets that environment and the application's own folders, named one by one,
# nothing else.  The build context is deny-by-default too (.dockerignore): keys,
# secrets, .env, databases, demo credentials, .venv and .git never reach a build.

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
COPY requirements.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install --extra-index-url "$TORCH_INDEX" -r /tmp/requirements.txt


FROM python:3.11-slim AS run

ARG CODE_VERSION=unknown
# HF_HUB_OFFLINE: models load from local folders only, nothing is fetched at run time.
# HF_HOME: where transformers copies a checkpoint's own modules (KIF's gates) before
# importing them; /app is not writable by the service user.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    ERASURE_CODE_VERSION=$CODE_VERSION \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/huggingface

RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq5 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /app erasure \
 && mkdir -p /data/checkpoints /data/corpora /data/keyring /data/chain-heads \
 && chown -R erasure /data

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY deletion/ deletion/
COPY workers/ workers/
COPY unlearning/ unlearning/
COPY migrations/ migrations/
COPY manage.py alembic.ini gunicorn.conf.py ./

# Run as an unprivileged user; checkpoints and keys live on mounted volumes and secrets.
USER erasure

EXPOSE 8000
CMD ["gunicorn", "deletion.wsgi:application", "--config", "gunicorn.conf.py", "--bind", "0.0.0.0:8000"]
