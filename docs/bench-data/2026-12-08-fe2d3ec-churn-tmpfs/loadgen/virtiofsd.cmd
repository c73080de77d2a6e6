/root/.cargo/bin/virtiofsd --socket-path=/var/tmp/tm/bench/virtiofsd.sock --shared-dir=/var/tmp/tm/bench/share --cache=never --log-level=warn 
