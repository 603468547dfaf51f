# The package is not installed yet (the C++ extension and `pip install .` come later): the tests
# import it from the source tree.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
