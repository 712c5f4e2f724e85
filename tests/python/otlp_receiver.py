"""A minimal OTLP/gRPC metrics and profiles receiver for gpuprofd's tests (tests/tests/otlp.rs).

Built from the opentelemetry-proto package's generated gRPC services and grpcio: every
ExportMetricsServiceRequest and ExportProfilesServiceRequest it receives is appended to OUT as
one JSON line (google.protobuf.json_format; a profiles request under the key "profiles"). Prints "listening PORT" once it serves, then serves until its
standard input closes.

    python3 otlp_receiver.py OUT [--tls CERT KEY]
"""

import json
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)


class Receiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            self.out.write(json.dumps(MessageToDict(request)) + "\n")
            self.out.flush()
        return metrics_service_pb2.ExportMetricsServiceResponse()


class ProfilesReceiver(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def __init__(self, out, lock):
        self.out = out
        self.lock = lock

    def Export(self, request, context):
        with self.lock:
            self.out.write(json.dumps({"profiles": MessageToDict(request)}) + "\n")
            self.out.flush()
        return profiles_service_pb2.ExportProfilesServiceResponse()


def main():
    out = open(sys.argv[1], "a", encoding="utf-8")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics = Receiver(out)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(metrics, server)
    profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(ProfilesReceiver(out, metrics.lock), server)
    if len(sys.argv) == 5 and sys.argv[2] == "--tls":
        with open(sys.argv[3], "rb") as c, open(sys.argv[4], "rb") as k:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
