# The demo project's image (docker-compose.yml runs it as "web" and "worker").
# Installs the pinned runtime block of requirements.txt, then the package itself.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=demo_project.settings \
    REACTOR_STATE_DIR=/tmp/reactor

WORKDIR /app

# Dependencies first, so code changes do not reinstall them: only the runtime block (the
# development pins below "# --- development" are not needed to run the project).
COPY requirements.txt ./
RUN sed -n '/^# --- runtime/,/^# --- development/p' requirements.txt > /tmp/runtime.txt \
    && pip install --no-cache-dir -r /tmp/runtime.txt

COPY . .
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 1000 reactor \
    && mkdir -p demo-output \
    && chown reactor demo-output

USER reactor
EXPOSE 8000
CMD ["python", "manage.py", "runserver", "0.0.0.0:8000"]
