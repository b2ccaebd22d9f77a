#[cfg(test)]
mod smoke {
    #[test]
    fn smoke() {
        glommio::LocalExecutorBuilder::default().spawn(|| async move {
            let l = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || { let _s = std::net::TcpStream::connect(addr).unwrap(); });
            let _s = l.accept().await.unwrap();
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            t.join().unwrap();
        }).unwrap().join().unwrap();
    }
}
