#!/usr/bin/env python3
"""test/distributed/test_launch_scripts.py: every launch script gives its ranks a rendezvous secret. The scripts run
for real with stand-ins for what they start (a command under scripts/run_local.sh; fake mpirun, srun and scontrol
first on PATH for scripts/run_mpi.sh and the Slurm scripts), and the stand-ins record the environment and arguments
each rank would get: LLM8_RDV_SECRET is set, 64 hex digits from /dev/urandom, the same on every rank, new on every
launch, kept when already set, and on no command line.
"""

import os
import re
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEX64 = re.compile(r"^[0-9a-f]{64}$")

# A stand-in: records the secret it sees and its arguments under $RECORD/<name>.<RANK or pid>.
STAND_IN = """#!/usr/bin/env bash
tag=${RANK:-$$}
printf '%s' "${LLM8_RDV_SECRET-}" > "$RECORD/$(basename "$0").$tag.secret"
printf '%s\\n' "$@" > "$RECORD/$(basename "$0").$tag.args"
exit 0
"""


class LaunchScripts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.record = os.path.join(self.tmp.name, "record")
        self.bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(self.record)
        os.makedirs(self.bin)
        for name in ("mpirun", "srun", "rank"):
            self.stand_in(name, STAND_IN)
        self.stand_in("scontrol", "#!/bin/sh\necho node1\necho node2\n")

    def tearDown(self):
        self.tmp.cleanup()

    def stand_in(self, name, text):
        path = os.path.join(self.bin, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)

    def run_script(self, args, **env_extra):
        env = {k: v for k, v in os.environ.items() if k != "LLM8_RDV_SECRET"}
        env.update(PATH=self.bin + os.pathsep + env["PATH"], RECORD=self.record, **env_extra)
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return proc

    def recorded(self, prefix):
        """{tag: (secret, args)} of the stand-in `prefix`, emptied for the next launch."""
        out = {}
        for name in sorted(os.listdir(self.record)):
            if name.startswith(prefix + ".") and name.endswith(".secret"):
                tag = name[len(prefix) + 1:-len(".secret")]
                with open(os.path.join(self.record, name)) as f:
                    secret = f.read()
                with open(os.path.join(self.record, f"{prefix}.{tag}.args")) as f:
                    args = f.read()
                out[tag] = (secret, args)
        for name in os.listdir(self.record):
            os.remove(os.path.join(self.record, name))
        return out

    def check_secret(self, records, ranks):
        self.assertEqual(len(records), ranks, records)
        secrets = {secret for secret, _ in records.values()}
        self.assertEqual(len(secrets), 1, "the ranks got different secrets")
        secret = secrets.pop()
        self.assertRegex(secret, HEX64)
        for _, args in records.values():
            self.assertNotIn(secret, args, "the secret is on a command line")
        return secret

    def test_run_local(self):
        launch = ["scripts/run_local.sh", "3", "--", "rank", "--some", "arg"]
        first = self.check_secret(self.recorded_after(launch, "rank"), 3)
        second = self.check_secret(self.recorded_after(launch, "rank"), 3)
        self.assertNotEqual(first, second, "two launches got the same secret")
        kept = "k" * 40
        self.run_script(launch, LLM8_RDV_SECRET=kept)
        self.assertEqual({s for s, _ in self.recorded("rank").values()}, {kept})

    def test_run_mpi(self):
        proc = self.run_script(["scripts/run_mpi.sh", "2", "--", "rank"])
        records = self.recorded("mpirun")
        self.check_secret(records, 1)
        args = next(iter(records.values()))[1].split("\n")
        self.assertIn("LLM8_RDV_SECRET", [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-x"],
                      f"mpirun does not forward the secret: {args} {proc.stderr}")

    def test_slurm_srun(self):
        for init in ("tcp", "fs"):
            self.run_script(["bash", "scripts/slurm_srun.sbatch", "configs/gpt2_tiny_bf16.json"], INIT=init,
                            FS_PATH=os.path.join(self.tmp.name, "rdv"), SLURM_JOB_ID="4242",
                            SLURM_JOB_NODELIST="node[1-2]", SLURM_SUBMIT_DIR=ROOT)
            self.check_secret(self.recorded("srun"), 1)

    def test_slurm_mpi(self):
        self.run_script(["bash", "scripts/slurm_mpi.sbatch", "configs/gpt2_tiny_bf16.json"], SLURM_JOB_ID="4242",
                        SLURM_JOB_NODELIST="node[1-2]", SLURM_SUBMIT_DIR=ROOT, SLURM_NTASKS="16",
                        SLURM_NTASKS_PER_NODE="8")
        records = self.recorded("mpirun")
        self.check_secret(records, 1)
        args = next(iter(records.values()))[1].split("\n")
        self.assertIn("LLM8_RDV_SECRET", [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-x"], args)

    def recorded_after(self, launch, prefix):
        self.run_script(launch)
        return self.recorded(prefix)


if __name__ == "__main__":
    unittest.main()
