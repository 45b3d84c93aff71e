module github.com/dnsstandby/dnsstandby/bench

go 1.26.8

replace github.com/dnsstandby/dnsstandby => ../
