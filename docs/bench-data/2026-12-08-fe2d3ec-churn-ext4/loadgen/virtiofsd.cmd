/root/.cargo/bin/virtiofsd --socket-path=/var/tmp/volfsd-bench/virtiofsd.sock --shared-dir=/var/tmp/volfsd-bench/share --cache=never --log-level=warn 
