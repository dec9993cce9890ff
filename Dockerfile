# The agent's container image: `docker build -t koordqos/koordqos:0.1.0 .`
# (the Helm chart runs `python -m koordqos run ...` in it). Not built in CI: this workplace has no Docker engine;
# `nox -s compiled` builds and tests the compiled hot path the same way (tools/compile.py).

# Stage 1: the NRI hot path compiled to C extensions by mypyc (docs/performance-history.md, "The compiled build").
FROM python:3.11-slim AS compile
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md /src/
COPY src /src/src
COPY tools /src/tools
RUN pip install --no-cache-dir "/src[dev]" setuptools && python /src/tools/compile.py --out /opt/koordqos

# Stage 2: the agent, its dependencies, and the compiled build first on the path (no compiler in the image).
FROM python:3.11-slim
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-cache-dir "/src[uvloop]" && rm -rf /src
COPY --from=compile /opt/koordqos /opt/koordqos
# `koordqos version` and the koordqos_build_info metric say "compiled (N modules)"
ENV PYTHONPATH=/opt/koordqos
ENTRYPOINT ["python", "-m", "koordqos"]
CMD ["run"]
