import os
import sys

# The launcher helpers (harness.py) live beside the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
