"""What the end-to-end test scripts share: each failed expectation is printed as it happens and
collected in `failures`, so one run reports every failure; main() exits non-zero when any."""
failures = []


def expect(cond, message):
    if not cond:
        failures.append(message)
        print("FAIL:", message, flush=True)
