# lit configuration: every *.trace file under tests/lit is a test; its RUN lines call kiln-opt
# and FileCheck (%s is the file, kiln-opt and FileCheck come from the build).
import os

import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".trace"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kiln_build_dir, "tests", "lit")
config.substitutions.append(("kiln-opt", config.kiln_opt))
config.substitutions.append(("FileCheck", config.filecheck))
config.substitutions.append(("%examples", config.kiln_examples))
# lit runs tests with a clean environment: pass on how kiln compiles and caches CPU kernels.
for name in ("KILN_CPU_KERNELS", "KILN_CACHE_DIR", "KILN_CXX", "KILN_COMPILE_JOBS", "HOME", "TMPDIR"):
    if name in os.environ:
        config.environment[name] = os.environ[name]
