"""The installed ``gpuprof`` package against a running gpuprofd.

Run by tests/tests/python_package.rs with the Python of a fresh venv that has
``pip install ./python``; it passes GPUPROF_API_SOCKET and GPUPROF_TEST_PROCESS_ID (the id of a
fake traced process that sends records).
"""

import os
import time
import unittest

import grpc

import gpuprof


class ClientTest(unittest.TestCase):
    def test_installed_from_the_package_with_typing(self):
        here = os.path.dirname(os.path.abspath(__file__))
        self.assertNotIn(os.path.dirname(here), gpuprof.__file__, "imported from the source tree, not the venv")
        pkg = os.path.dirname(gpuprof.__file__)
        for f in ("py.typed", os.path.join("v1", "gpuprof_pb2.pyi"), os.path.join("v1", "gpuprof_pb2_grpc.py")):
            self.assertTrue(os.path.exists(os.path.join(pkg, f)), f)

    def test_status_sessions_and_query(self):
        # The default socket comes from GPUPROF_API_SOCKET.
        with gpuprof.Client() as c:
            self.assertTrue(c.status().version)
            s = c.start_session(all_processes=True, name="from-the-package", preset="kernels")
            self.assertEqual(gpuprof.state_name(s.state), "active")
            self.assertEqual([p.process_id for p in s.processes], [int(os.environ["GPUPROF_TEST_PROCESS_ID"])])
            deadline = time.time() + 20
            while c.session(s.id).records < 500:
                self.assertLess(time.time(), deadline, "no records arrived")
                time.sleep(0.05)
            done = c.stop_session(s.id)
            self.assertEqual(gpuprof.state_name(done.state), "completed")
            self.assertIn(s.id, [x.id for x in c.sessions()])
            self.assertEqual([x.name for x in c.sessions(name_contains="from-the")], ["from-the-package"])
            kernels = list(c.query(s.id))
            self.assertTrue(kernels)
            self.assertTrue(all(isinstance(k, gpuprof.pb.KernelRow) for k in kernels))
            self.assertEqual(len(kernels), c.summary(s.id).kernel_count)
            self.assertEqual(len(list(c.query(s.id, limit=3))), 3)
            with self.assertRaises(grpc.RpcError) as e:
                c.session(987654)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            # Its one process belongs to no distributed job: no ranks to compare.
            with self.assertRaises(grpc.RpcError) as e:
                c.job_summary(s.id)
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            # PC sampling: this agent reports no GPU, so the session gets no samples.
            p = c.start_session(all_processes=True, name="pc", preset="pc", pc_sampling=True)
            self.assertTrue(p.collect.pc_sampling)
            self.assertEqual(p.collect.preset, "pc")
            c.stop_session(p.id)
            top = c.pc_top(p.id, group_by="line")
            self.assertIsInstance(top, gpuprof.pb.QueryPcSamplesResponse)
            self.assertEqual((top.total_samples, list(top.rows)), (0, []))
            with self.assertRaises(ValueError):
                c.pc_top(p.id, group_by="bogus")
            # The two sessions compared, kernel by kernel, every kernel of each side accounted for.
            d = c.diff(s.id, p.id)
            self.assertIsInstance(d, gpuprof.pb.DiffSummaryResponse)
            self.assertEqual((d.label_a, d.label_b), (f"session {s.id}", f"session {p.id}"))
            self.assertTrue(d.kernels)
            self.assertEqual(sum(k.count_a for k in d.kernels), c.summary(s.id).kernel_count)
            self.assertEqual(sum(k.count_b for k in d.kernels), c.summary(p.id).kernel_count)
            self.assertEqual(d.findings, sum(1 for k in d.kernels if k.significant))
            self.assertIn("standard deviation", d.noise_rule)
            # Neither has PC samples: nothing to compare.
            with self.assertRaises(grpc.RpcError) as e:
                c.pc_diff(s.id, p.id)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            with self.assertRaises(grpc.RpcError) as e:
                c.diff(s.id, 987654)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            with self.assertRaises(grpc.RpcError) as e:
                c.start_session(all_processes=True, preset="pc")
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main(verbosity=2)
