"""Hugging Face Accelerate's own test scripts, run case by case against accelify (test-only)."""
