"""Programs in other languages that produce for the scheduler, written from the README alone."""
