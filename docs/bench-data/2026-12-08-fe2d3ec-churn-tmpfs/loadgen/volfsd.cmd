/work/main/target/release/volfsd --socket-path /var/tmp/tm/bench/volfsd.sock --shared-dir /var/tmp/tm/bench/share --cache none --log-level warn 
