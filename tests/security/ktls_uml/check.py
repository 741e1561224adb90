"""Inside a kernel with the tls module (tests/security/ktls_uml/run.sh): a broker with an SSL listener,
records produced and fetched over TLS by copyless's client, compared byte for byte; the broker must have
sent every fetched record byte with sendfile on kTLS sessions and copied none. Exit status 1 otherwise."""

import asyncio
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

work = sys.argv[1]
certs = f"{work}/certs"
from copyless.broker.security.tls import kernel_tls_available  # noqa: E402

print("detection:", kernel_tls_available(), flush=True)
with open(f"{work}/broker.toml", "w") as config:
    config.write(f'"ssl.keystore.location" = "{certs}/broker.pem"\n"ssl.truststore.location" = "{certs}/ca.pem"\n'
                 '"log.segment.bytes" = 67108864\n')
log_path = f"{work}/broker.log"
with open(log_path, "w") as log_file:  # the child has its own copy of the descriptor
    broker = subprocess.Popen([sys.executable, "-m", "copyless.broker", "serve", "--data-dir", f"{work}/tmp/data",
                               "--listener", "SSL=127.0.0.1:0", "--config", f"{work}/broker.toml"],
                              stdout=log_file, stderr=subprocess.STDOUT)
address = None
for _ in range(600):
    time.sleep(0.2)
    found = re.search(r"listening on (127\.0\.0\.1:\d+)", pathlib.Path(log_path).read_text())
    if found:
        address = found.group(1)
        break
print("startup:", [line for line in pathlib.Path(log_path).read_text().splitlines() if "listening on" in line],
      flush=True)

from copyless import Consumer, Producer  # noqa: E402
from copyless.client.assignors import TopicPartition  # noqa: E402

options = dict(security_protocol="SSL", ssl_cafile=f"{certs}/ca.pem")
values = [os.urandom(1000) + i.to_bytes(4, "big") for i in range(20_000)]


async def main():
    async with Producer(address, acks=1, **options) as producer:
        for value in values:
            await producer.send("ktls", value)
        await producer.flush()
    got = []
    async with Consumer(bootstrap_servers=address, auto_offset_reset="earliest", **options) as consumer:
        consumer.assign([TopicPartition("ktls", 0)])
        deadline = time.monotonic() + 120
        while len(got) < len(values) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got.extend(r.value for r in records)
    return got


got = asyncio.run(main())
broker.send_signal(signal.SIGUSR1)
time.sleep(2)
stats_lines = [line for line in pathlib.Path(log_path).read_text().splitlines() if line.startswith("stats-json")]
stats = json.loads(stats_lines[-1][11:])
broker.send_signal(signal.SIGTERM)
broker.wait(60)
security = stats["security"]
print("records equal:", got == values, len(got))
print("security:", json.dumps(security))
print("fetch_sendfile_bytes", stats["fetch_sendfile_bytes"], "fetch_copied_bytes", stats["fetch_copied_bytes"])
ok = (got == values and security.get("ktls_sessions", 0) > 0 and stats["fetch_copied_bytes"] == 0
      and security.get("ktls_sendfile_bytes", 0) >= 20_000 * 1000)
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
