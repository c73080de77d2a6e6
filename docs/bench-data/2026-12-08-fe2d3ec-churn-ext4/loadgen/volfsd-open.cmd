/work/main/target/release/volfsd --socket-path /var/tmp/volfsd-bench/volfsd-open.sock --shared-dir /var/tmp/volfsd-bench/share --cache none --log-level warn --sandbox none --seccomp none
