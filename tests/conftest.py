import os
import sys

# tests import each other's helpers (reference.py, test_reference.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
