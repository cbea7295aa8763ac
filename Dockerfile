# Memstore image: one image for the API (default command), the workers (`memstore worker`)
# and migrations (`memstore migrate`). Build from the repository root: `docker build -t memstore .`
ARG PYTHON_IMAGE=python:3.11-slim

# --- build: install the package and its dependencies into a virtualenv ----------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# .dockerignore keeps the context to what `pip install ./client .` needs (the SDK first: the
# server depends on it).
COPY . .
RUN pip install --no-cache-dir ./client . \
    && memstore references install

# --- runtime: the virtualenv only, run as an unprivileged user ------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN groupadd --system --gid 10001 memstore \
    && useradd --system --uid 10001 --gid memstore --home-dir /home/memstore --create-home \
       --shell /usr/sbin/nologin memstore

COPY --from=build /opt/venv /opt/venv

WORKDIR /home/memstore
USER 10001:10001

EXPOSE 8000

# Liveness of the API process (the slim image has no curl). Worker and migrate containers
# started from this image should disable it (the Compose file does).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]

CMD ["memstore", "serve", "--host", "0.0.0.0", "--port", "8000"]
