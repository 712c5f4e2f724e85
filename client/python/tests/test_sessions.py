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
