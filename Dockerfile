# A single-node copyless broker.
#
# The base image is a build argument, and dependencies can come from a local wheelhouse, so the image also
# builds on machines with no container registry or no direct package index access:
#   pip wheel . -w wheelhouse            # on the host: copyless and its dependencies as wheels
#   docker-compose build                 # installs from ./wheelhouse when it holds wheels, else from the index
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
WORKDIR /opt/copyless
COPY . /src
# A virtualenv keeps the install independent of the base image's Python packaging policy (PEP 668).
RUN python3 -m venv /opt/venv \
    && if ls /src/wheelhouse/*.whl >/dev/null 2>&1; then \
           /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /src/wheelhouse copyless; \
       else \
           /opt/venv/bin/pip install --no-cache-dir /src; \
       fi \
    && rm -rf /src && mkdir -p /var/lib/copyless
ENV PATH=/opt/venv/bin:$PATH
EXPOSE 9092
VOLUME /var/lib/copyless
ENTRYPOINT ["copyless", "serve", "--data-dir", "/var/lib/copyless", "--listen", "0.0.0.0:9092"]
