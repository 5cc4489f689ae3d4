module example.com/scheduler-interop

go 1.22
