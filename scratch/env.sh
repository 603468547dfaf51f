export KILN_EXT_DIR=/work/main/build/py/python/kiln
export KILN_OPT=/work/main/build/py/tools/kiln-opt/kiln-opt
export PYTHONPATH=/work/main/python
