# Prometheus for the compose cluster's opt-in "metrics" profile (cluster/up.sh --metrics), built by
# cluster/build-images.sh --prometheus on the debootstrap base: Debian's own prometheus package, from the mirror
# the base was made from (no registry). Kept out of the base image: it adds ~330 MB and about a minute to a
# build (measured), which every run of the docker tests would pay for a service only some people start.
ARG BASE_IMAGE=copyless-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
    && mkdir -p /prometheus
COPY prometheus.yml /etc/prometheus/copyless.yml
VOLUME /prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus"]
CMD ["--config.file=/etc/prometheus/copyless.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=0.0.0.0:9090"]
