/work/main/target/release/volfsd --socket-path /var/tmp/volfsd-bench/volfsd.sock --shared-dir /var/tmp/volfsd-bench/share --cache none --log-level warn 
