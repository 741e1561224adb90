# The copyless broker image. Built by cluster/build-images.sh, which makes the base (Debian bookworm from
# debootstrap, loaded with `docker import`: python3, python3-venv, etcd) and assembles the build context:
#
#   wheelhouse/*.whl    copyless and every dependency as wheels for CPython 3.11 (no package index is used)
#   copyless-health     cluster/health.py, the ApiVersions probe behind the compose healthchecks
#
# By hand: cluster/build-images.sh prints the image names; there is no registry base to pull.
ARG BASE_IMAGE=copyless-base:bookworm
FROM ${BASE_IMAGE}
# A virtualenv keeps the install apart from Debian's Python packaging (PEP 668).
COPY wheelhouse /tmp/wheelhouse
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse copyless \
    && rm -rf /tmp/wheelhouse \
    && mkdir -p /var/lib/copyless \
    && /opt/venv/bin/copyless serve --help >/dev/null
COPY copyless-health /usr/local/bin/copyless-health
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 9092
VOLUME /var/lib/copyless
# The broker is PID 1 and handles SIGTERM itself (flush, checkpoints, clean-shutdown marker).
ENTRYPOINT ["copyless"]
CMD ["serve", "--data-dir", "/var/lib/copyless", "--listen", "0.0.0.0:9092"]
