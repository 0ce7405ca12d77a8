#!/usr/bin/env python3
"""test/dev/test_check_layers.py: the layering check of the build (cmake/check_layers.cmake).

The build runs the check over every file of each llmc/<layer>/ folder with the layers that folder may include (itself
and the transitive closure of the dependencies declared in llmc/CMakeLists.txt). Here it runs on small synthetic
files: an allowed include passes and writes the stamp; an include of a higher layer, or of a header outside any layer
folder, fails naming the file and the line, and writes no stamp. The last test checks that llmc/CMakeLists.txt
declares the layer order of the README (core first, run last) and that no declared dependency points upwards.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "cmake", "check_layers.cmake")
ORDER = ["core", "kernels", "precision", "model", "optim", "distributed", "io", "run"]


class CheckLayers(unittest.TestCase):
    def setUp(self):
        if shutil.which("cmake") is None:
            raise unittest.SkipTest("cmake not found")
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_check(self, layer, allowed, text):
        src = os.path.join(self.dir, "file.h")
        with open(src, "w") as f:
            f.write(text)
        spec = os.path.join(self.dir, "spec.cmake")
        with open(spec, "w") as f:
            f.write('set(LAYER %s)\nset(ALLOWED "%s")\nset(FILES "%s")\n' % (layer, ";".join(allowed), src))
        stamp = os.path.join(self.dir, "stamp")
        if os.path.exists(stamp):
            os.remove(stamp)
        r = subprocess.run(["cmake", "-DSPEC=" + spec, "-DSTAMP=" + stamp, "-P", SCRIPT], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr, os.path.exists(stamp)

    def test_allowed_includes_pass(self):
        rc, out, stamped = self.run_check("precision", ["precision", "kernels", "core"],
                                          '#include <vector>\n#include "llmc/core/common.h"\n'
                                          '  #  include "llmc/kernels/gelu.h"\n#include "llmc/precision/gemm.h"\n')
        self.assertEqual(rc, 0, out)
        self.assertTrue(stamped)

    def test_higher_layer_fails_naming_file_and_line(self):
        rc, out, stamped = self.run_check("kernels", ["kernels", "core"],
                                          '#include "llmc/core/common.h"\n#include "llmc/run/config.h"\n')
        self.assertNotEqual(rc, 0)
        self.assertFalse(stamped)
        self.assertIn("layering violation in layer 'kernels'", out)
        self.assertIn('#include "llmc/run/config.h"', out)
        self.assertIn("file.h", out)

    def test_header_outside_a_layer_folder_fails(self):
        rc, out, stamped = self.run_check("core", ["core"], '#include "llmc/loose_header.h"\n')
        self.assertNotEqual(rc, 0)
        self.assertFalse(stamped)
        self.assertIn("every llmc header lives in a layer folder", out)

    def test_declared_dependencies_point_downwards(self):
        with open(os.path.join(REPO, "llmc", "CMakeLists.txt")) as f:
            text = f.read()
        declared = re.findall(r"^llmc_layer\((\w+)(?: DEPS ([\w ]+?))?(?: LIBS [^)]*)?\)", text, re.M)
        names = [name for name, _ in declared]
        self.assertEqual(names, ORDER)
        for name, deps in declared:
            for dep in deps.split():
                self.assertLess(ORDER.index(dep), ORDER.index(name), "%s depends on %s" % (name, dep))
        # every folder of llmc/ is a declared layer
        folders = sorted(d for d in os.listdir(os.path.join(REPO, "llmc"))
                         if os.path.isdir(os.path.join(REPO, "llmc", d)))
        self.assertEqual(folders, sorted(ORDER))


if __name__ == "__main__":
    unittest.main()
