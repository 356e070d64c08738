"""Extensions written as a plugin would write them, one file each (tests/test_extending.py uses them)."""
