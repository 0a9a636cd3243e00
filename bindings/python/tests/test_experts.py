"""Tests of expertpack.Experts (experts.h) in host memory against the synthetic model of scripts/test-bindings:
the bytes of every acquired role equal the pack's payload of that (layer, expert, role), read from the pack
file at the offsets ep_pack_object gives, for the pack and for the GGUF read without a pack, through a cache
of top_k experts and a host tier; errors name what is wrong. NumPy arrays and PyTorch tensors over the
roles where those are installed (skipped, saying so, where not).

Environment (set by scripts/test-bindings): EP_TEST_MODEL (an Expert Pack), EP_TEST_SOURCE (its GGUF),
EP_TEST_DIR (a scratch folder)."""
import importlib.util
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import expertpack as ep  # noqa: E402

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run scripts/test-bindings")
    return value


def pack_bytes(pack_path, pack, layer, expert, role):
    """Role ``role`` of (layer, expert) as the pack file holds it."""
    o = pack.object(layer, expert)
    with open(pack_path, "rb") as f:
        f.seek(o.role_offset[role])
        return f.read(o.role_bytes[role])


@unittest.skipUnless(ep.HAVE_EXPERTS, "the loaded library predates the expert-store API")
class ExpertsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pack_path = env("EP_TEST_MODEL")
        cls.source = env("EP_TEST_SOURCE")
        cls.scratch = tempfile.mkdtemp(dir=env("EP_TEST_DIR"))
        with ep.Experts(cls.pack_path, device=ep.Device.CPU) as x:
            cls.info = x.info()
        cls.small = dict(device=ep.Device.CPU, cache_budget_bytes=cls.info.top_k * cls.info.slot_bytes,
                         host_cache_bytes=2 * cls.info.slot_bytes)

    def sweep(self, store):
        """Every expert of every layer, three times, top_k at a time (each id given twice), checked against
        the pack file, then experts evicted and asked for again (host-tier hits)."""
        info = store.info()
        self.assertEqual(info.device, "cpu")
        self.assertEqual(info.cache_slots, info.top_k)
        k = info.top_k
        with ep.Pack(self.pack_path) as pack:
            def check(layer, ids):
                with store.acquire(layer, ids + ids) as lease:
                    self.assertEqual(lease.ids, ids + ids)
                    if len(ids) * 2 > info.max_table_ids:
                        self.assertIsNone(lease.device_table)
                    else:
                        self.assertIsNotNone(lease.device_table)
                    lay = store.layout(layer)
                    for i, e in enumerate(lease.ids):
                        self.assertEqual(lease.objects[i], info.slots_address + lease.slots[i] * info.slot_bytes)
                        for r in ep.Role:
                            self.assertEqual(lease.address(i, r), lease.objects[i] + lay.roles[r].offset)
                            got = bytes(lease.view(i, r))
                            self.assertEqual(got, pack_bytes(self.pack_path, pack, layer, e, int(r)),
                                             f"layer {layer} expert {e} role {r.name}")
            for _ in range(3):
                for layer in range(info.num_layers):
                    for first in range(0, info.num_experts - k + 1, k):
                        check(layer, list(range(first, first + k)))
            for ids in (list(range(k)), list(range(k, 2 * k)), list(range(k))):
                check(0, ids)
        s = store.stats()
        self.assertGreater(s.cache_evictions, 0)
        self.assertGreater(s.demotions, 0)
        self.assertGreater(s.host_hits, 0)

    def test_pack(self):
        with ep.Experts(self.pack_path, **self.small) as store:
            self.assertEqual(os.path.realpath(store.pack_path), os.path.realpath(self.pack_path))
            lay = store.layout(0)
            self.assertEqual(len(lay.roles), 3)
            self.assertEqual(lay.roles[ep.Role.GATE].offset, 0)
            self.assertEqual(lay.object_bytes, lay.roles[ep.Role.DOWN].offset + lay.roles[ep.Role.DOWN].bytes)
            self.sweep(store)

    def test_source_without_pack(self):
        with ep.Experts(self.source, no_pack=True, pack_dir=self.scratch, **self.small) as store:
            self.assertTrue(store.pack_path.endswith(".epx"))
            self.sweep(store)

    def test_errors(self):
        with ep.Experts(self.pack_path, **self.small) as store:
            n = store.info().num_experts
            with self.assertRaises(ep.InvalidArgumentError) as c:
                store.acquire(0, [0, n])
            self.assertIn(f"expert id {n} at position 1 is outside 0..{n - 1}", str(c.exception))
            with self.assertRaises(ep.InvalidArgumentError) as c:
                store.acquire(store.info().num_layers, [0])
            self.assertIn("out of range", str(c.exception))
            with self.assertRaises(ep.InvalidArgumentError) as c:
                store.hint(0, [0])
            self.assertIn("without prefetch", str(c.exception))
            with self.assertRaises(ValueError):
                store.acquire(0, [0], stream=1234)  # host memory takes no stream
            lease = store.acquire(0, [1])
            lease.release()
            with self.assertRaises(ValueError):
                lease.view(0, ep.Role.UP)
            lease = store.acquire(0, [2])
        with self.assertRaises(ep.InvalidArgumentError) as c:
            lease.release()  # after the store was closed
        self.assertIn("store was closed", str(c.exception))
        with self.assertRaises(ep.NotFoundError):
            ep.Experts(os.path.join(self.scratch, "missing.gguf"), device=ep.Device.CPU)

    def test_hint_and_stats_file(self):
        path = os.path.join(self.scratch, "stats.json")
        with ep.Experts(self.pack_path, device=ep.Device.CPU, prefetch=True, stats_path=path, stats_every=1) as store:
            store.hint(1, [3, 1])
            with store.acquire(1, [1, 3]) as lease:
                self.assertEqual((lease.hits, lease.misses), (2, 0))
            self.assertEqual(store.stats().prefetch_used, 2)
        self.assertEqual(ep.read_store_stats(path).acquires, 1)

    def test_dlpack_capsule(self):
        """The DLPack producer without a consumer: a capsule named "dltensor" over the role, whose tensor is
        freed with the capsule when nobody takes it, and refused once the lease is released."""
        from expertpack import experts as ex
        with ep.Experts(self.pack_path, **self.small) as store:
            lease = store.acquire(0, [1])
            view = ex._DLPackView(lease, lease.address(0, ep.Role.UP), lease.layout.roles[ep.Role.UP])
            self.assertEqual(view.__dlpack_device__(), (1, 0))  # kDLCPU
            before = len(ex._exported)
            capsule = view.__dlpack__()
            self.assertEqual(type(capsule).__name__, "PyCapsule")
            self.assertEqual(len(ex._exported), before + 1)
            del capsule
            self.assertEqual(len(ex._exported), before)
            lease.release()
            with self.assertRaises(ValueError):
                view.__dlpack__()

    def test_numpy(self):
        if not HAVE_NUMPY:
            self.skipTest("NumPy is not installed: Lease.array() not tested")
        import numpy as np
        with ep.Experts(self.pack_path, **self.small) as store, ep.Pack(self.pack_path) as pack:
            lay = store.layout(1)
            with store.acquire(1, [2, 0]) as lease:
                for i, e in enumerate(lease.ids):
                    for r in ep.Role:
                        a = lease.array(i, r)
                        role = lay.roles[r]
                        self.assertEqual(a.shape[0], role.ne[1])
                        self.assertEqual(a.nbytes, role.bytes)
                        want = np.frombuffer(pack_bytes(self.pack_path, pack, 1, e, int(r)), dtype=np.uint8)
                        self.assertTrue(np.array_equal(a.view(np.uint8).reshape(-1), want))

    def test_torch_host(self):
        if not HAVE_TORCH:
            self.skipTest("PyTorch is not installed: Lease.tensor() not tested")
        import torch
        with ep.Experts(self.pack_path, **self.small) as store, ep.Pack(self.pack_path) as pack:
            with store.acquire(0, [1]) as lease:
                t = lease.tensor(0, ep.Role.DOWN)
                self.assertEqual(t.device.type, "cpu")
                want = pack_bytes(self.pack_path, pack, 0, 1, int(ep.Role.DOWN))
                self.assertEqual(bytes(t.view(torch.uint8).reshape(-1).tolist()), want)


if __name__ == "__main__":
    unittest.main()
