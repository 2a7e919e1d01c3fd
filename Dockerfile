FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv

RUN useradd --create-home --uid 10001 agents
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
COPY agents ./agents
RUN pip install -e . && chown -R agents:agents /srv

USER agents
ENV HOST=0.0.0.0 PORT=8000 AGENTS_DIR=/srv/agents WORKER_HEARTBEAT_FILE=/tmp/agents-worker.heartbeat
EXPOSE 8000
# `agents health worker` for a worker container (docker-compose.yml sets it per service)
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 CMD ["agents", "health", "api"]
CMD ["agents", "api"]
