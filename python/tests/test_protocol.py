"""The package's plain part (`fleetmend.protocol`), with the standard library only."""

import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stderr

import fleetmend
from fleetmend import protocol


def environ(**changes):
    env = {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", "FLEETMEND_JOB_ID": "job-1", "FLEETMEND_CHECKPOINT_DIR": "/c",
        "FLEETMEND_RESTART_COUNT": "3",
    }
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


class EnvironmentTest(unittest.TestCase):
    def test_a_good_environment_is_read(self):
        env = fleetmend.ProtocolEnv.from_environ(environ())
        self.assertEqual((env.rank, env.world_size, env.local_rank), (1, 2, 1))
        self.assertEqual((env.master_port, env.job_id, env.restart_count), (29500, "job-1", 3))

    def test_every_problem_is_named_at_once(self):
        bad = environ(RANK="5", MASTER_PORT="0", FLEETMEND_JOB_ID="", MASTER_ADDR=None)
        with self.assertRaises(ValueError) as caught:
            fleetmend.ProtocolEnv.from_environ(bad)
        message = str(caught.exception)
        for part in ("RANK='5' must be less than WORLD_SIZE=2", "MASTER_PORT='0'",
                     "FLEETMEND_JOB_ID='' is empty", "MASTER_ADDR is not set"):
            self.assertIn(part, message)


class CheckpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def write(self, step, files=None):
        return fleetmend.write_checkpoint(self.dir, step, 2, "job-1", files or {"w.bin": bytes([step]) * 1000})

    def test_a_written_checkpoint_verifies_and_its_damage_is_named(self):
        path = self.write(4)
        manifest = fleetmend.verify_checkpoint(path)
        self.assertEqual((manifest["step"], manifest["world_size"]), (4, 2))
        with open(os.path.join(path, "w.bin"), "r+b") as f:
            f.truncate(10)
        with self.assertRaisesRegex(fleetmend.InvalidCheckpoint, "truncated"):
            fleetmend.verify_checkpoint(path)

    def test_the_newest_valid_one_is_resumed_and_the_refused_named(self):
        self.write(1)
        broken = self.write(2)
        os.remove(os.path.join(broken, "manifest.json"))
        log = io.StringIO()
        with redirect_stderr(log):
            step, path, _ = fleetmend.newest_valid_checkpoint(self.dir)
        self.assertEqual(step, 1)
        self.assertIn("step-00000002", log.getvalue())
        self.assertIn("unfinished write", log.getvalue())

    def test_sealing_files_written_by_others_lists_each_with_its_hash(self):
        temp = os.path.join(self.dir, protocol.temp_dir_name(9, "job-1-0"))
        os.mkdir(temp)
        for name in ("__0_0.distcp", "__1_0.distcp"):
            with open(os.path.join(temp, name), "wb") as f:
                f.write(name.encode() * 100)
        path = fleetmend.seal_checkpoint(self.dir, temp, 9, 2, "job-1")
        names = [f["name"] for f in fleetmend.verify_checkpoint(path)["files"]]
        self.assertEqual(names, ["__0_0.distcp", "__1_0.distcp"])
        self.assertEqual(os.listdir(self.dir), ["step-00000009"])
        again = os.path.join(self.dir, protocol.temp_dir_name(9, "job-1-1"))
        os.mkdir(again)
        with self.assertRaises(fleetmend.StepExists):
            fleetmend.seal_checkpoint(self.dir, again, 9, 2, "job-1")

    def test_retention_keeps_the_newest_valid_ones(self):
        for step in (1, 2, 3, 4):
            self.write(step)
        fleetmend.prune_checkpoints(self.dir, 2)
        self.assertEqual(sorted(os.listdir(self.dir)), ["step-00000003", "step-00000004"])

    def test_a_bad_file_name_is_refused(self):
        with self.assertRaisesRegex(ValueError, "one path component"):
            self.write(5, {"a/b": b""})


if __name__ == "__main__":
    unittest.main()
