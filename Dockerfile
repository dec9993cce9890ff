# The agent's container image: `docker build -t koordqos/koordqos:0.1.0 .`
# (the Helm chart runs `python -m koordqos run ...` in it). Not built in CI: this workplace has no Docker engine.
FROM python:3.11-slim
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-cache-dir "/src[uvloop]" && rm -rf /src
ENTRYPOINT ["python", "-m", "koordqos"]
CMD ["run"]
