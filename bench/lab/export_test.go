package lab

// GuestLock lets tests hold off other processes' boots, and with them the
// reaping of dead guests, while they look at what a dead guest left.
var GuestLock = guestLock
