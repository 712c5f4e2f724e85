"""The Python client, generated from the repository's .proto, against a running gpuprofd.

Run by tests/tests/sessions_python.rs, which starts the daemon and a fake traced process and
passes: GPUPROF_API_SOCKET, GPUPROF_TEST_PROCESS_ID (the fake process's daemon id),
GPUPROF_GEN_DIR (where to generate the code).
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpuprofclient  # noqa: E402

import grpc  # noqa: E402


class StockChannelTest(unittest.TestCase):
    """What any grpcio program does: a plain channel on the socket, no options."""

    @classmethod
    def setUpClass(cls):
        gpuprofclient.generate(os.environ["GPUPROF_GEN_DIR"])
        cls.channel = grpc.insecure_channel("unix://" + os.path.abspath(os.environ["GPUPROF_API_SOCKET"]))

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()

    def test_api_and_health_with_no_channel_options(self):
        pb, rpc = gpuprofclient.pb, gpuprofclient.rpc
        status = rpc.GpuprofStub(self.channel).GetStatus(pb.GetStatusRequest(), timeout=10)
        self.assertTrue(status.version)
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", "gpuprof.v1.Gpuprof"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)

    def test_reflection_lists_the_services(self):
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = list(stub.ServerReflectionInfo(iter([req]), timeout=10))
        names = sorted(s.name for s in answers[0].list_services_response.service)
        self.assertEqual(
            names, ["gpuprof.v1.Gpuprof", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"]
        )


class SessionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        gpuprofclient.generate(os.environ["GPUPROF_GEN_DIR"])
        cls.pb = gpuprofclient.pb
        cls.c = gpuprofclient.Client(os.environ["GPUPROF_API_SOCKET"])
        cls.process_id = int(os.environ["GPUPROF_TEST_PROCESS_ID"])

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_start_list_stop(self):
        c, pb = self.c, self.pb
        self.assertTrue(c.status().version)
        s = c.start_session(all_processes=True, name="from-python", preset="kernels")
        self.assertEqual(gpuprofclient.state_name(s.state), "active")
        self.assertEqual([p.process_id for p in s.processes], [self.process_id])
        listed = c.list_sessions(states=[pb.SESSION_STATE_ACTIVE])
        self.assertIn(s.id, [x.id for x in listed])
        self.assertEqual([x.name for x in listed if x.id == s.id], ["from-python"])
        # Let records arrive.
        deadline = time.time() + 20
        while c.get_session(s.id).records < 1000:
            self.assertLess(time.time(), deadline, "no records arrived")
            time.sleep(0.05)
        done = c.stop_session(s.id)
        self.assertEqual(gpuprofclient.state_name(done.state), "completed")
        self.assertEqual(done.stop_reason, "stopped by user")
        self.assertGreaterEqual(done.records, 1000)
        self.assertEqual(done.processes[0].state, "stopped")
        self.assertNotIn(s.id, [x.id for x in c.list_sessions(states=[pb.SESSION_STATE_ACTIVE])])
        self.assertIn(s.id, [x.id for x in c.list_sessions(states=[pb.SESSION_STATE_COMPLETED])])
        summary = c.summary(s.id, top=3)
        self.assertEqual(len(summary.top_kernels), 3)
        self.assertEqual(summary.kernel_count, sum(1 for _ in c.kernels(s.id)))
        path = os.path.join(os.environ["GPUPROF_GEN_DIR"], "trace.json")
        events = c.export_chrome(s.id, path)
        with open(path) as f:
            trace = json.load(f)
        self.assertEqual(events, len([e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]))

    def test_errors_carry_grpc_codes(self):
        c = self.c
        with self.assertRaises(grpc.RpcError) as e:
            c.get_session(987654)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(grpc.RpcError) as e:
            c.start_session()
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("targets", e.exception.details())


if __name__ == "__main__":
    unittest.main(verbosity=2)
