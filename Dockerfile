# The app as a Hugging Face Space (sdk: docker, app_port: 8501), or anywhere Docker runs:
#   docker build -t llm-memory . && docker run -p 8501:8501 llm-memory
FROM python:3.12-slim

# Spaces run the container as UID 1000
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    HF_HUB_DISABLE_TELEMETRY=1
WORKDIR $HOME/app

COPY --chown=user . .
RUN pip install --no-cache-dir --user -r requirements.txt

EXPOSE 8501
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://localhost:8501/_stcore/health')"
# Spaces embed the app in a cross-site iframe: the XSRF cookie needs SameSite=None there, or the
# JSON imports (file uploads) are refused with 403.
CMD ["streamlit", "run", "app.py", "--server.port=8501", "--server.address=0.0.0.0", "--server.headless=true", \
     "--server.xsrfCookieSameSite=none"]
